gaac_add_test(engine_test ${CMAKE_CURRENT_LIST_DIR}/engine_test.cpp)
gaac_add_test(ops_test ${CMAKE_CURRENT_LIST_DIR}/ops_test.cpp)
