gaac_add_test(quants_test ${CMAKE_CURRENT_LIST_DIR}/quants_test.cpp)
