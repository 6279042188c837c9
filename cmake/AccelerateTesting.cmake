# Test helpers: labelled GoogleTest executables and compile-fail twins.

include_guard(GLOBAL)

# accelerate_add_test_executable(name LABEL label SOURCES ... [TIMEOUT s])
# One GoogleTest executable on the shared PCH; its tests are registered with CTest under LABEL.
function(accelerate_add_test_executable name)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT" "SOURCES" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  accelerate_use_pch(${name})
  target_link_libraries(${name} PRIVATE GTest::gtest_main)
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
