# Fails when a header or a body file (.ipp) outside include/accelerate/compat/ tests
# TORCH_VERSION_* (cmake -P, -DROOT=<include dir>): LibTorch version differences belong in
# compat/ only.
file(GLOB_RECURSE headers "${ROOT}/*.hpp" "${ROOT}/*.ipp")
set(offenders)
foreach(header IN LISTS headers)
  if(header MATCHES "/compat/")
    continue()
  endif()
  file(STRINGS "${header}" hits REGEX "TORCH_VERSION_")
  if(hits)
    list(APPEND offenders "${header}")
  endif()
endforeach()
if(offenders)
  message(FATAL_ERROR "TORCH_VERSION_ outside compat/: ${offenders}")
endif()
message(STATUS "no TORCH_VERSION_ outside compat/")
