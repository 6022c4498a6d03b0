target_sources(gaac PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/thread_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops_avx2.cpp)
# ops follow llama.cpp's arithmetic operation for operation: nothing may fuse that is not written fused.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ops.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ops_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-ffp-contract=off")
else()
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/ops_avx2.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
endif()
