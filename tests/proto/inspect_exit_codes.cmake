# Runs gradtrace-inspect on good and damaged traces and checks exit codes and
# the one-line error. Invoked by ctest:
#   cmake -DINSPECT=... -DWRITER=... -DWORK=... -P inspect_exit_codes.cmake
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND "${WRITER}" "${WORK}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "write_sample_trace failed: ${rc}")
endif()

function(expect want_rc)
  execute_process(COMMAND "${INSPECT}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL want_rc)
    message(FATAL_ERROR "gradtrace-inspect ${ARGN}: exit ${rc}, expected ${want_rc}\nstdout:\n${out}\nstderr:\n${err}")
  endif()
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
endfunction()

function(expect_match text regex)
  if(NOT text MATCHES "${regex}")
    message(FATAL_ERROR "expected to match '${regex}':\n${text}")
  endif()
endfunction()

expect(0 "${WORK}/set/rank-00000.gtrace")
expect_match("${out}" "compression ratio [0-9.]+")
expect_match("${out}" "producer +write_sample_trace 0.1.0")
expect_match("${out}" "1 +0 +POST_REDUCE +1 +1 +4096")
expect(0 "${WORK}/set/rank-00001.gtrace" --verify --frames)
expect_match("${out}" "verify +ok")
expect(0 "${WORK}/set")  # a trace-set directory
expect_match("${out}" "rank-00001.gtrace")

expect(2 "${WORK}/truncated.gtrace")
expect_match("${err}" "^gradtrace-inspect: [^\n]*truncated.gtrace: offset [0-9]+: truncated frame (header|payload): [0-9]+ of [0-9]+ bytes\n$")
expect(2 "${WORK}/corrupt.gtrace" --verify)
expect_match("${err}" "^gradtrace-inspect: [^\n]*corrupt.gtrace: offset [0-9]+: checksum mismatch")
expect(2 "${WORK}/set/rank-00000.gtrace" "${WORK}/no-such.gtrace")
expect_match("${err}" "no-such.gtrace: cannot open: No such file or directory")
expect(2 "${WORK}")  # a directory without rank-*.gtrace
expect(2)            # usage error
expect(0 --help)
file(REMOVE_RECURSE "${WORK}")
