# `cmake --install build [--prefix DIR]`: kiln's headers under include/kiln/, the library, the
# kiln CLI where it was built, and a package config so that a project writes
#   find_package(kiln 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE kiln::kiln)
# and nothing else (examples/external builds so in CI: scripts/check_install.sh).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

# Every header of every layer keeps its folder: include/kiln/core/tensor.hpp, ...
# Headers that include a private dependency (Eigen) are kiln's own and stay out: every installed
# header compiles alone with the prefix's include/ (scripts/check_install.sh checks).
foreach(layer IN LISTS KILN_LAYERS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${layer}
          COMPONENT kiln_development FILES_MATCHING PATTERN "*.hpp"
          PATTERN "eigen_util.hpp" EXCLUDE PATTERN "body_eval.hpp" EXCLUDE PATTERN "row_chunks.hpp" EXCLUDE)
endforeach()
install(FILES ${KILN_BUILD_INCLUDE}/kiln/kiln.hpp ${KILN_BUILD_INCLUDE}/kiln/version.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln COMPONENT kiln_development)

install(TARGETS kiln EXPORT kilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kiln_development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT kiln_runtime NAMELINK_COMPONENT kiln_development)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR} COMPONENT kiln_development)

configure_package_config_file(${PROJECT_SOURCE_DIR}/scripts/cmake/kilnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so 0.1 satisfies only requests for 0.1.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR} COMPONENT kiln_development)
