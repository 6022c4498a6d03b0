target_sources(gaac PRIVATE ${CMAKE_CURRENT_LIST_DIR}/gguf.cpp)
