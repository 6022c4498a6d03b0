# Quantized weight formats: scalar reference, AVX2 kernels, dispatch.
target_sources(gaac PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/quants.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quants_reference.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quants_avx2.cpp)
# Dequantization must round every multiply and add separately (it is tested bit for bit), so neither
# file lets the compiler contract a*b+c into an FMA; the AVX2 kernels use FMA only explicitly.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_reference.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_avx2.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c;-ffp-contract=off")
else()
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quants_avx2.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
endif()
