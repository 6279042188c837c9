# Compressed gradient buckets train as well as uncompressed ones (cmake -P): one epoch of
# `fashion_mnist --nproc 2` with each DdpOptions::compression; test accuracy within 0.5 points
# of the uncompressed run for fp16 and bf16, within 1.5 points for PowerSGD (rank 4, from step
# 10), and the gradient bytes each sent as a fraction of the uncompressed run's:
#   fp16, bf16: exactly 1/2;
#   PowerSGD: the classifier's 28938 parameters become 8262 values per step (conv1 16x25 ->
#   4*(16+25) = 164, conv2 32x400 -> 1728, fc 10x1568 -> 6312, biases 58 as they are), so
#   with the first 10 of 469 steps uncompressed: (10*28938 + 459*8262) / (469*28938) = 0.3008.
# The uncompressed run also logs with the jsonl tracker, whose lines must carry the step's
# communication time (comm/exposed_ms, comm/busy_ms).
#   -DEXE=<fashion_mnist> -DPYTHON=<python3, for the arithmetic cmake lacks> -DWORK=<scratch folder>
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

include(${CMAKE_CURRENT_LIST_DIR}/example_json.cmake)

function(run compression out_accuracy out_bytes)
  example_json(last WORKING_DIRECTORY "${WORK}"
               ARGS --nproc 2 --epochs 1 --no-progress --compression ${compression} ${ARGN})
  string(JSON accuracy GET "${last}" test_accuracy)
  string(JSON bytes GET "${last}" gradient_bytes_sent)
  string(JSON reported GET "${last}" compression)
  if(NOT reported STREQUAL compression)
    message(FATAL_ERROR "asked for ${compression}, the run reports ${reported}")
  endif()
  set(${out_accuracy} ${accuracy} PARENT_SCOPE)
  set(${out_bytes} ${bytes} PARENT_SCOPE)
endfunction()

# Accuracy drop in thousandths, bytes in millionths of the uncompressed run's.
function(check compression accuracy bytes max_drop_thousandths expected_millionths)
  execute_process(COMMAND ${PYTHON} -c "print(round((${base_accuracy} - ${accuracy}) * 1000, 3), round(${bytes} / ${base_bytes} * 1e6))"
                  OUTPUT_VARIABLE computed OUTPUT_STRIP_TRAILING_WHITESPACE)
  separate_arguments(computed)
  list(GET computed 0 drop)
  list(GET computed 1 fraction)
  message(STATUS "${compression}: accuracy ${accuracy} (uncompressed ${base_accuracy}), bytes ${fraction} millionths")
  if(drop GREATER ${max_drop_thousandths})
    message(FATAL_ERROR "${compression}: accuracy ${accuracy} is more than ${max_drop_thousandths}/1000 below ${base_accuracy}")
  endif()
  math(EXPR off "${fraction} - ${expected_millionths}")
  if(off GREATER 100 OR off LESS -100)
    message(FATAL_ERROR "${compression}: sent ${fraction} millionths of the uncompressed bytes, expected ${expected_millionths}")
  endif()
endfunction()

run(none base_accuracy base_bytes --log-with jsonl)
file(GLOB_RECURSE metrics "${WORK}/*metrics.jsonl")
if(NOT metrics)
  message(FATAL_ERROR "the jsonl tracker wrote no metrics.jsonl under ${WORK}")
endif()
file(STRINGS "${metrics}" logged REGEX "comm/exposed_ms")
list(LENGTH logged lines)
if(lines LESS 4)  # every 100 of 469 steps
  message(FATAL_ERROR "${metrics} carries comm/exposed_ms on ${lines} lines, expected 4")
endif()
run(fp16 fp16_accuracy fp16_bytes)
check(fp16 ${fp16_accuracy} ${fp16_bytes} 5 500000)
run(bf16 bf16_accuracy bf16_bytes)
check(bf16 ${bf16_accuracy} ${bf16_bytes} 5 500000)
run(power_sgd psgd_accuracy psgd_bytes)
check(power_sgd ${psgd_accuracy} ${psgd_bytes} 15 300741)
file(REMOVE_RECURSE "${WORK}")
