gaac_add_test(gguf_test ${CMAKE_CURRENT_LIST_DIR}/gguf_test.cpp)
