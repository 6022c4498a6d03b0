# Third-party libraries, all from the distribution's packages (see README.md, "Dependencies").
set(GAAC_XXHASH_INCLUDE_DIR "" CACHE PATH
    "Directory holding xxhash.h, used header-only (XXH_INLINE_ALL), for machines without pkg-config's libxxhash")
if(NOT GAAC_XXHASH_INCLUDE_DIR OR GAAC_BUILD_BENCHMARKS)
  find_package(PkgConfig REQUIRED)
endif()
if(GAAC_XXHASH_INCLUDE_DIR)
  add_library(PkgConfig::GAAC_XXHASH INTERFACE IMPORTED)
  set_target_properties(PkgConfig::GAAC_XXHASH PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${GAAC_XXHASH_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)
else()
  pkg_check_modules(GAAC_XXHASH REQUIRED IMPORTED_TARGET libxxhash)
endif()
find_package(nlohmann_json 3.10 REQUIRED)

if(GAAC_BUILD_TOOLS OR GAAC_BUILD_TESTS)
  find_package(CLI11 REQUIRED)
  find_package(fmt REQUIRED)
endif()
if(GAAC_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(GAAC_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
  find_package(zstd REQUIRED)
  pkg_check_modules(GAAC_LZ4 REQUIRED IMPORTED_TARGET liblz4)
endif()
