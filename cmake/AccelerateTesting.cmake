# Test helpers: labelled GoogleTest executables and compile-fail twins.

include_guard(GLOBAL)

# accelerate_add_test_executable(name LABEL label SOURCES ... [TIMEOUT s])
# One GoogleTest executable on the shared PCH; its tests are registered with CTest under LABEL.
# Its main() is the shared one of accelerate_test_support (tests/support/main.cpp), so any of
# its tests may start real processes.
function(accelerate_add_test_executable name)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "SOURCES" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  accelerate_use_pch(${name})
  target_link_libraries(${name} PRIVATE accelerate_test_support)
  # Listing the tests loads LibTorch's CUDA libraries: 0.4 s warm here and 1.3 s with the page
  # cache dropped; GoogleTest's 5 s default leaves little room on a GPU machine's colder disk.
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 30
    PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# accelerate_compile_fail(case REGEX regex [LABEL label])
# tests/compile_fail/<case>_ok.cpp must compile and <case>_fail.cpp must fail with a
# diagnostic matching `regex` (a bare failure does not pass, so a typo cannot fake success).
# Both are built on demand by CTest, serially, with the shared precompiled header, and only
# checked (-fsyntax-only: templates are instantiated and diagnosed, no code is generated,
# which takes a quarter less time; no object file is written).
function(accelerate_compile_fail case)
  cmake_parse_arguments(ARG "" "REGEX;LABEL" "" ${ARGN})
  if(NOT ARG_LABEL)
    set(ARG_LABEL unit)
  endif()
  foreach(kind ok fail)
    set(target compile_${kind}_${case})
    add_library(${target} OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/${case}_${kind}.cpp)
    accelerate_use_pch(${target})
    target_compile_options(${target} PRIVATE -fsyntax-only)
    add_test(NAME compile_fail.${case}.${kind}
             COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target ${target} -j 1)
    set_tests_properties(compile_fail.${case}.${kind} PROPERTIES
      LABELS ${ARG_LABEL} RESOURCE_LOCK build_tree TIMEOUT 300)
  endforeach()
  set_tests_properties(compile_fail.${case}.fail PROPERTIES PASS_REGULAR_EXPRESSION "${ARG_REGEX}")
endfunction()
