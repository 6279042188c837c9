# example_json(<out> [WORKING_DIRECTORY <dir>] ARGS <arg>...): runs ${EXE} with the arguments
# and returns the JSON object its last output line prints (the example checks include this).
# A non-zero exit, or a last line that is not a JSON object, is a failure showing the output.
function(example_json out_json)
  cmake_parse_arguments(PARSE_ARGV 1 RUN "" "WORKING_DIRECTORY" "ARGS")
  if(NOT RUN_WORKING_DIRECTORY)
    set(RUN_WORKING_DIRECTORY .)
  endif()
  execute_process(COMMAND ${EXE} ${RUN_ARGS} WORKING_DIRECTORY "${RUN_WORKING_DIRECTORY}"
                  OUTPUT_VARIABLE output ERROR_VARIABLE errors RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} ${RUN_ARGS} failed (${rc}):\n${output}\n${errors}")
  endif()
  string(STRIP "${output}" output)
  string(REGEX REPLACE ".*\n" "" last "${output}")
  string(JSON type ERROR_VARIABLE json_error TYPE "${last}")
  if(json_error OR NOT type STREQUAL "OBJECT")
    message(FATAL_ERROR "${EXE} ${RUN_ARGS}: the last line is not a JSON object: ${last}")
  endif()
  message(STATUS "${last}")
  set(${out_json} "${last}" PARENT_SCOPE)
endfunction()
