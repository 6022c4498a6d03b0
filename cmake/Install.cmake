# Installation and the CMake package that lets consumers write find_package(gaac).
include(CMakePackageConfigHelpers)

set(gaac_installed_targets gaac gaac_static)
if(GAAC_HAVE_CUDA)
  list(APPEND gaac_installed_targets gaac_cuda)  # gaac::cuda
endif()
install(TARGETS ${gaac_installed_targets} EXPORT gaacTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/gaac DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT gaacTargets NAMESPACE gaac:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gaac)
if(GAAC_BUILD_TOOLS)
  install(TARGETS gaac_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(cmake/gaacConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/gaacConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gaac)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gaacConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/gaacConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/gaacConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/gaac)
