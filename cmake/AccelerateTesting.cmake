# Test helpers: labelled GoogleTest executables and compile-fail twins.

include_guard(GLOBAL)

# accelerate_add_test_executable(name LABEL label [MAIN_PROVIDED] SOURCES ... [TIMEOUT s])
# One GoogleTest executable on the shared PCH; its tests are registered with CTest under LABEL.
# MAIN_PROVIDED: the sources define main() (multi-process tests), else gtest_main is linked.
function(accelerate_add_test_executable name)
  cmake_parse_arguments(ARG "MAIN_PROVIDED" "LABEL;TIMEOUT" "SOURCES" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  accelerate_use_pch(${name})
  if(NOT ARG_MAIN_PROVIDED)
    target_link_libraries(${name} PRIVATE GTest::gtest_main)
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABEL}" TIMEOUT ${ARG_TIMEOUT})
endfunction()
