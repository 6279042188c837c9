# Shared settings of the project's own tests, benchmarks and examples: warnings, ccache, and
# one precompiled LibTorch header built once and reused by every target (LibTorch's headers
# cost about 20 s per translation unit without it).

include_guard(GLOBAL)

find_program(ACCELERATE_CCACHE ccache)
if(ACCELERATE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # Precompiled headers are cacheable only with these sloppiness settings. BASEDIR makes paths
  # inside this tree relative in the cache key, so another clone of the project (a CI run in a
  # fresh checkout on the same machine) hits the cache instead of rebuilding every object.
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
      "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
      "CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}" CCACHE_NOHASHDIR=true
      ${ACCELERATE_CCACHE})
endif()

# Everything the project's own binaries share; identical flags keep the PCH reusable.
add_library(accelerate_dev INTERFACE)
target_link_libraries(accelerate_dev INTERFACE accelerate::accelerate)
target_compile_options(accelerate_dev INTERFACE -Wall -Wextra -Wno-unused-parameter
  # Designated initializers that leave fields to their defaults are the intended style.
  -Wno-missing-field-initializers)
find_package(Threads REQUIRED)
find_package(GTest QUIET)
find_package(benchmark QUIET)
# Without the Debian packages (a GPU host), build the test frameworks from third_party/.
if(NOT GTest_FOUND AND EXISTS "${ACCELERATE_THIRD_PARTY_DIR}/googletest/CMakeLists.txt")
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory(${ACCELERATE_THIRD_PARTY_DIR}/googletest ${PROJECT_BINARY_DIR}/third_party/googletest EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest)
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()
if(NOT benchmark_FOUND AND EXISTS "${ACCELERATE_THIRD_PARTY_DIR}/benchmark/CMakeLists.txt")
  set(BENCHMARK_ENABLE_TESTING OFF CACHE BOOL "" FORCE)
  set(BENCHMARK_ENABLE_GTEST_TESTS OFF CACHE BOOL "" FORCE)
  set(BENCHMARK_ENABLE_INSTALL OFF CACHE BOOL "" FORCE)
  set(BENCHMARK_ENABLE_WERROR OFF CACHE BOOL "" FORCE)
  add_subdirectory(${ACCELERATE_THIRD_PARTY_DIR}/benchmark ${PROJECT_BINARY_DIR}/third_party/benchmark EXCLUDE_FROM_ALL)
endif()
target_link_libraries(accelerate_dev INTERFACE GTest::gtest benchmark::benchmark Threads::Threads)

# The header is named, not given by path: CMake writes the path it is given into the generated
# wrapper, and an absolute path of this checkout there would give every other checkout (CI's
# clone) a different precompiled header, so none of their objects could come from ccache.
target_include_directories(accelerate_dev INTERFACE ${PROJECT_SOURCE_DIR}/tests)
add_library(accelerate_pch OBJECT ${PROJECT_SOURCE_DIR}/tests/support/pch_anchor.cpp)
target_link_libraries(accelerate_pch PRIVATE accelerate_dev)
target_precompile_headers(accelerate_pch PRIVATE <pch.hpp>)

# accelerate_use_pch(target): compile `target` with the shared precompiled header.
function(accelerate_use_pch target)
  target_link_libraries(${target} PRIVATE accelerate_dev)
  target_precompile_headers(${target} REUSE_FROM accelerate_pch)
endfunction()
