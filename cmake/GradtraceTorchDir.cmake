# Sets GRADTRACE_TORCH_DIR (cache) to the torch package directory of the given
# Python, unless already set: LibTorch (FindGradtraceTorch) and the pybind11
# headers of the Python bindings both come from that one wheel.
function(gradtrace_torch_dir python)
  if(GRADTRACE_TORCH_DIR OR NOT EXISTS "${python}")
    return()
  endif()
  execute_process(COMMAND "${python}" -c "import os, torch; print(os.path.dirname(torch.__file__))"
                  OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0)
    set(GRADTRACE_TORCH_DIR "${_dir}" CACHE PATH "torch package directory")
  endif()
endfunction()
