# install.cmake - what a host application links and what `cmake --install`
# puts under a prefix:
#   lib/libwna16.so.X.Y.Z  SONAME libwna16.so.<major>; exports only the
#                          public API (wna16_*, cmake/wna16.map); links
#                          its dependencies itself (LLVM, cJSON, xxHash...)
#   lib/libwna16.a         the same objects; its users link the private
#                          dependencies too (the package files list them)
#   bin/wna16              the command line
#   include/wna16.h        the one public header
#   share/wna16/specs/     the built-in specs (they are also compiled into
#                          the library: this copy is for reading, editing
#                          and WNA16_SPEC_DIR)
#   share/wna16/examples/  examples/ (C, Python, the CMake project)
#   lib/cmake/wna16/       find_package(wna16): wna16::wna16 (the shared
#                          library; the static one when wna16_USE_STATIC_LIBS
#                          is set), wna16::shared, wna16::static
#   lib/pkgconfig/wna16.pc pkg-config wna16 (--static: Libs.private)
# As a subproject (add_subdirectory, FetchContent) the same targets exist
# under the same names, as ALIASes: wna16::wna16, wna16::shared,
# wna16::static. Included by the top CMakeLists.txt after the library.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(WNA16_INSTALL "Generate wna16's install rules" ${PROJECT_IS_TOP_LEVEL})

# ---- the shared library -----------------------------------------------------
# The static library's objects (all position-independent), linked again:
# nothing is compiled twice.
set(WNA16_VERSION_SCRIPT ${CMAKE_CURRENT_SOURCE_DIR}/cmake/wna16.map)
add_library(wna16_shared SHARED $<TARGET_OBJECTS:wna16>)
set_target_properties(wna16_shared PROPERTIES
  OUTPUT_NAME wna16
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LINK_DEPENDS ${WNA16_VERSION_SCRIPT})
target_link_options(wna16_shared PRIVATE
  -Wl,--version-script=${WNA16_VERSION_SCRIPT} -Wl,--no-undefined)
get_target_property(WNA16_PRIVATE_DEPS wna16 LINK_LIBRARIES)
target_link_libraries(wna16_shared PRIVATE ${WNA16_PRIVATE_DEPS})
target_include_directories(wna16_shared INTERFACE
  $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
add_dependencies(wna16_shared wna16)

add_library(wna16::wna16 ALIAS wna16_shared)
add_library(wna16::shared ALIAS wna16_shared)
add_library(wna16::static ALIAS wna16)

# ---- the private dependencies, as files --------------------------------------
# For the static library's users: each dependency of libwna16.a as the
# linker sees it (a full path for a CMake target, -lNAME for a system
# library, -pthread for Threads). Generator expressions, resolved when the
# package files are generated.
set(wna16_deps_cmake "")
set(wna16_deps_pc "")
foreach(dep IN LISTS WNA16_PRIVATE_DEPS)
  if(dep STREQUAL "Threads::Threads")
    list(APPEND wna16_deps_cmake "Threads::Threads")
    list(APPEND wna16_deps_pc "-pthread")
  elseif(TARGET ${dep})
    list(APPEND wna16_deps_cmake "$<TARGET_LINKER_FILE:${dep}>")
    list(APPEND wna16_deps_pc "$<TARGET_LINKER_FILE:${dep}>")
  elseif(IS_ABSOLUTE "${dep}")
    list(APPEND wna16_deps_cmake "${dep}")
    list(APPEND wna16_deps_pc "${dep}")
  else()
    list(APPEND wna16_deps_cmake "${dep}")
    list(APPEND wna16_deps_pc "-l${dep}")
  endif()
endforeach()
list(REMOVE_DUPLICATES wna16_deps_pc)
string(REPLACE ";" " " WNA16_PC_LIBS_PRIVATE "${wna16_deps_pc}")
set(WNA16_CMAKE_STATIC_DEPS "${wna16_deps_cmake}")

# ---- package files -------------------------------------------------------------
set(wna16_pkg ${CMAKE_CURRENT_BINARY_DIR}/package)
set(WNA16_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/wna16)
set(WNA16_SHARED_NAME "$<TARGET_FILE_NAME:wna16_shared>")
set(WNA16_SHARED_SONAME "$<TARGET_SONAME_FILE_NAME:wna16_shared>")
set(WNA16_STATIC_NAME "$<TARGET_FILE_NAME:wna16>")
configure_package_config_file(
  ${CMAKE_CURRENT_SOURCE_DIR}/cmake/wna16Config.cmake.in
  ${wna16_pkg}/wna16Config.cmake.gen
  INSTALL_DESTINATION ${WNA16_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR)
file(GENERATE OUTPUT ${wna16_pkg}/wna16Config.cmake
     INPUT ${wna16_pkg}/wna16Config.cmake.gen)
# 0.x: a new minor version may change the API, so only the same minor
# version is compatible; from 1.0 on, SameMajorVersion.
write_basic_package_version_file(${wna16_pkg}/wna16ConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
file(RELATIVE_PATH WNA16_PC_TO_PREFIX
     /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" WNA16_PC_TO_PREFIX "${WNA16_PC_TO_PREFIX}")
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/wna16.pc.in
               ${wna16_pkg}/wna16.pc.gen @ONLY)
file(GENERATE OUTPUT ${wna16_pkg}/wna16.pc INPUT ${wna16_pkg}/wna16.pc.gen)

# ---- install rules ---------------------------------------------------------------
if(WNA16_INSTALL)
  install(TARGETS wna16_shared
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(TARGETS wna16
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(TARGETS wna16_cli
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/include/wna16.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/specs/
          DESTINATION ${CMAKE_INSTALL_DATADIR}/wna16/specs
          FILES_MATCHING PATTERN "*.json")
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/examples/
          DESTINATION ${CMAKE_INSTALL_DATADIR}/wna16/examples
          PATTERN "__pycache__" EXCLUDE)
  # the Python package (pure Python over libwna16.so): PYTHONPATH=this
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/python/wna16
          DESTINATION ${CMAKE_INSTALL_DATADIR}/wna16/python
          PATTERN "__pycache__" EXCLUDE)
  install(FILES ${wna16_pkg}/wna16Config.cmake
                ${wna16_pkg}/wna16ConfigVersion.cmake
          DESTINATION ${WNA16_CMAKE_DIR})
  install(FILES ${wna16_pkg}/wna16.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
