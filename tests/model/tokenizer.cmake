gaac_add_test(tokenizer_test ${CMAKE_CURRENT_LIST_DIR}/tokenizer_test.cpp)
