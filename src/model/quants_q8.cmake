# Quantized activations (ggml's vec_dot_type) and integer block products: scalar reference and dispatch,
# AVX2 kernels.
target_sources(gaac PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/quants_q8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quants_q8_avx2.cpp)
# The reference follows ggml's expressions with every operation rounded on its own: no contraction.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_q8.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_q8_avx2.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-ffp-contract=off")
else()
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_q8_avx2.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
endif()
