# Finds what accelerate::accelerate links: LibTorch 2.x, Boost (Hana), range-v3,
# nlohmann-json, zlib, and Gloo's headers.
#
# LibTorch: a given Torch_DIR or CMAKE_PREFIX_PATH wins (any libtorch 2.x zip works);
# otherwise the project's virtual environment (.venv, made by scripts/quickstart.sh) or the
# Python named by ACCELERATE_PYTHON is asked for torch.utils.cmake_prefix_path.

include_guard(GLOBAL)

find_package(Torch CONFIG QUIET)
if(NOT Torch_FOUND)
  set(_accelerate_pythons "${ACCELERATE_PYTHON}" "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  foreach(_python IN LISTS _accelerate_pythons)
    if(_python AND EXISTS "${_python}")
      execute_process(
        COMMAND "${_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
        OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _torch_result ERROR_QUIET)
      if(_torch_result EQUAL 0 AND _torch_prefix)
        message(STATUS "accelerate: LibTorch from ${_python}: ${_torch_prefix}")
        list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
        break()
      endif()
    endif()
  endforeach()
  find_package(Torch CONFIG)
endif()
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "accelerate: LibTorch 2.x not found. Run scripts/quickstart.sh (it makes .venv with "
    "torch==2.11.0), or pass -DCMAKE_PREFIX_PATH=<libtorch> or -DACCELERATE_PYTHON=<python with torch>.")
endif()
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "accelerate: needs LibTorch 2.x, found ${Torch_VERSION}")
endif()
message(STATUS "accelerate: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")

find_package(Boost 1.74 REQUIRED)
find_package(range-v3 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)

# ProcessGroupGloo.hpp includes <gloo/...>; PyTorch's wheel does not ship those headers.
# Debian's libgloo-dev provides them (only pointers to gloo types appear in c10d's classes, so
# the declarations are all that is needed; the code is inside libtorch_cpu).
find_path(ACCELERATE_GLOO_INCLUDE_DIR gloo/algorithm.h
  HINTS ${TORCH_INCLUDE_DIRS} "${PROJECT_SOURCE_DIR}/third_party/gloo/include"
  DOC "Folder holding gloo/algorithm.h")
if(NOT ACCELERATE_GLOO_INCLUDE_DIR)
  message(WARNING "accelerate: Gloo headers not found (apt-get install libgloo-dev); the Gloo "
                  "backend will not compile. Set ACCELERATE_GLOO_INCLUDE_DIR to their folder.")
endif()

# CUDA/NCCL paths compile wherever the LibTorch build has CUDA, even without a GPU.
if(TARGET torch_cuda)
  set(ACCELERATE_TORCH_HAS_CUDA ON)
else()
  set(ACCELERATE_TORCH_HAS_CUDA OFF)
endif()
