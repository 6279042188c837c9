# Install rules: headers, the exported INTERFACE target and a relocatable package config, so
# an outside project does find_package(accelerate CONFIG REQUIRED).

include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(ACCELERATE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/accelerate"
    CACHE STRING "Where accelerateConfig.cmake is installed")

install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS accelerate accelerate_separate_compilation EXPORT accelerateTargets)
if(TARGET accelerate_yaml_config)
  install(TARGETS accelerate_yaml_config EXPORT accelerateTargets)
endif()
install(EXPORT accelerateTargets NAMESPACE accelerate:: DESTINATION ${ACCELERATE_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/accelerateConfig.cmake.in
  ${PROJECT_BINARY_DIR}/accelerateConfig.cmake
  INSTALL_DESTINATION ${ACCELERATE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/accelerateConfigVersion.cmake
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_BINARY_DIR}/accelerateConfig.cmake
              ${PROJECT_BINARY_DIR}/accelerateConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/AccelerateTorch.cmake
        DESTINATION ${ACCELERATE_INSTALL_CMAKEDIR})
