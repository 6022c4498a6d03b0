gaac_add_test(quants_q8_test ${CMAKE_CURRENT_LIST_DIR}/quants_q8_test.cpp)
