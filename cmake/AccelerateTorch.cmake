# accelerate_find_torch(): find LibTorch 2.x and provide the `torch` target.
#
# Where from: Torch_DIR or CMAKE_PREFIX_PATH when given (any libtorch 2.x zip), else the
# Python named by ACCELERATE_PYTHON, else the project's .venv (made by scripts/quickstart.sh),
# asked for torch.utils.cmake_prefix_path.
#
# Why not always find_package(Torch): PyTorch's Linux wheel is a CUDA build, and its
# TorchConfig.cmake stops with a fatal error when no CUDA toolkit (nvcc) is installed, even
# though nothing here compiles CUDA code and the wheel carries the CUDA runtime itself. On
# such machines (a fresh Debian, a GPU host with only PyTorch) the libraries are imported
# directly: libtorch, libtorch_cpu, libc10 and, for the NCCL backend, libtorch_cuda and
# libc10_cuda with the wheel's CUDA and NCCL headers.

include_guard(GLOBAL)

function(_accelerate_torch_config_dir out)
  set(hints ${Torch_DIR})
  if(DEFINED ENV{Torch_DIR})
    list(APPEND hints $ENV{Torch_DIR})
  endif()
  find_path(_accelerate_torch_config TorchConfig.cmake
    HINTS ${hints}
    PATH_SUFFIXES share/cmake/Torch Torch cmake/Torch
    NO_CACHE)
  if(NOT _accelerate_torch_config)
    set(pythons "${ACCELERATE_PYTHON}" "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    foreach(python IN LISTS pythons)
      if(python AND EXISTS "${python}")
        execute_process(
          COMMAND "${python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
          OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE
          RESULT_VARIABLE result ERROR_QUIET)
        if(result EQUAL 0 AND EXISTS "${prefix}/Torch/TorchConfig.cmake")
          set(_accelerate_torch_config "${prefix}/Torch")
          message(STATUS "accelerate: LibTorch from ${python}")
          break()
        endif()
      endif()
    endforeach()
  endif()
  set(${out} "${_accelerate_torch_config}" PARENT_SCOPE)
endfunction()

# Imports the libraries of the LibTorch under `root` as the `torch` target.
function(_accelerate_import_torch root)
  file(STRINGS "${root}/include/torch/headeronly/version.h" version_lines REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
  foreach(line IN LISTS version_lines)
    string(REGEX MATCH "TORCH_VERSION_(MAJOR|MINOR|PATCH) ([0-9]+)" _ "${line}")
    set(v_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  endforeach()
  set(Torch_VERSION "${v_MAJOR}.${v_MINOR}.${v_PATCH}" PARENT_SCOPE)
  set(lib "${root}/lib")
  set(defines USE_DISTRIBUTED USE_C10D_GLOO USE_RPC USE_TENSORPIPE)
  set(includes "${root}/include" "${root}/include/torch/csrc/api/include")
  # Static registrations (operators, backends) live in these libraries: keep them linked.
  set(links "-Wl,--no-as-needed" "${lib}/libtorch_cpu.so" "${lib}/libc10.so")
  if(EXISTS "${lib}/libtorch_cuda.so")
    list(APPEND links "${lib}/libtorch_cuda.so" "${lib}/libc10_cuda.so")
    list(APPEND defines USE_C10D_NCCL)
    get_filename_component(site "${root}" DIRECTORY)
    foreach(sub nvidia/cu13/include nvidia/cuda_runtime/include nvidia/nccl/include)
      if(EXISTS "${site}/${sub}")
        list(APPEND includes "${site}/${sub}")
      endif()
    endforeach()
    set(ACCELERATE_TORCH_IMPORTED_CUDA ON PARENT_SCOPE)
  endif()
  list(APPEND links "-Wl,--as-needed" "-Wl,-rpath,${lib}")
  add_library(torch SHARED IMPORTED GLOBAL)
  set_target_properties(torch PROPERTIES
    IMPORTED_LOCATION "${lib}/libtorch.so"
    INTERFACE_INCLUDE_DIRECTORIES "${includes}"
    INTERFACE_COMPILE_DEFINITIONS "${defines}"
    INTERFACE_LINK_LIBRARIES "${links}")
  set(TORCH_INCLUDE_DIRS "${includes}" PARENT_SCOPE)
  set(TORCH_INSTALL_PREFIX "${root}" PARENT_SCOPE)
endfunction()

macro(accelerate_find_torch)
  _accelerate_torch_config_dir(_accelerate_torch_dir)
  if(NOT _accelerate_torch_dir)
    message(FATAL_ERROR
      "accelerate: LibTorch 2.x not found. Run scripts/quickstart.sh (it makes .venv with "
      "torch==2.11.0), or pass -DCMAKE_PREFIX_PATH=<libtorch> or -DACCELERATE_PYTHON=<python with torch>.")
  endif()
  get_filename_component(_accelerate_torch_root "${_accelerate_torch_dir}/../../.." ABSOLUTE)
  find_program(_accelerate_nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATHS /usr/local/cuda/bin NO_CACHE)
  if(EXISTS "${_accelerate_torch_root}/lib/libtorch_cuda.so" AND NOT _accelerate_nvcc
     AND NOT DEFINED ENV{CUDACXX} AND NOT TARGET torch)
    message(STATUS "accelerate: no CUDA toolkit; importing LibTorch's libraries from ${_accelerate_torch_root}")
    _accelerate_import_torch("${_accelerate_torch_root}")
    set(Torch_FOUND ON)
    set(Torch_DIR "${_accelerate_torch_dir}")
  else()
    set(Torch_DIR "${_accelerate_torch_dir}")
    # PyTorch's CUDA probe (a try_compile in FindCUDA's GPU detection) inherits the CUDA
    # dialect from CMAKE_CXX_STANDARD; CUDA20 cannot be set by CMake 3.25 with this nvcc, so a
    # consumer that set CMAKE_CXX_STANDARD 20 failed to configure on every GPU machine. The
    # probe gets CUDA 17 unless the consumer chose a CUDA standard; the choice is undone after.
    set(_accelerate_set_cuda_standard OFF)
    if(NOT DEFINED CMAKE_CUDA_STANDARD)
      set(CMAKE_CUDA_STANDARD 17)
      set(_accelerate_set_cuda_standard ON)
    endif()
    find_package(Torch CONFIG REQUIRED)
    if(_accelerate_set_cuda_standard)
      unset(CMAKE_CUDA_STANDARD)
    endif()
  endif()
  if(Torch_VERSION VERSION_LESS 2.0)
    message(FATAL_ERROR "accelerate: needs LibTorch 2.x, found ${Torch_VERSION}")
  endif()
  message(STATUS "accelerate: LibTorch ${Torch_VERSION} (${_accelerate_torch_root})")
endmacro()
