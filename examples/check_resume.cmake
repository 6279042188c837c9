# The example's resume is exact (cmake -P): 2 epochs straight, and 1 epoch + --resume for the
# second, print the same JSON and write byte-identical models. "seconds", "allreduce_calls",
# the bytes sent and the time on collectives describe this process, not the training, and are
# left out. Epochs are the
# first 12800 training samples (200 batches of 64): the property is the same on any length,
# and the four runs then take a quarter of the time of full epochs.
#   -DEXE=<fashion_mnist> -DWORK=<scratch folder> [-DEXTRA="--nproc;2"]
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/example_json.cmake)

function(run out_json)
  example_json(last ARGS --no-progress --max-train-samples 12800 ${EXTRA} ${ARGN})
  string(JSON last REMOVE "${last}" seconds)
  foreach(key allreduce_calls gradient_bytes_sent comm_seconds comm_exposed_seconds comm_overlap)
    string(JSON last REMOVE "${last}" ${key})
  endforeach()
  set(${out_json} "${last}" PARENT_SCOPE)
endfunction()

run(straight --epochs 2 --project-dir "${WORK}/straight")
run(first --epochs 1 --project-dir "${WORK}/resumed")
run(resumed --epochs 2 --project-dir "${WORK}/resumed" --resume)
if(NOT straight STREQUAL resumed)
  message(FATAL_ERROR "resumed run differs:\n${straight}\n${resumed}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files
                "${WORK}/straight/model/model.safetensors" "${WORK}/resumed/model/model.safetensors"
                RESULT_VARIABLE different)
if(different)
  message(FATAL_ERROR "the resumed model differs from the uninterrupted one")
endif()
file(REMOVE_RECURSE "${WORK}")
message(STATUS "resume is exact")
