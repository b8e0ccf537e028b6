# Finds TensorFlow through the Python that has it and sets SPARSYNC_TF_FOUND with
# SPARSYNC_TF_INCLUDE_DIR, SPARSYNC_TF_DEFINITIONS, SPARSYNC_TF_CXX_STANDARD and
# SPARSYNC_TF_FRAMEWORK (the libtensorflow_framework.so.2 the op library links), all from
# tf.sysconfig. The Python is SPARSYNC_TF_PYTHON, by default the TensorFlow environment that
# deploy/install_deps.sh creates (<repo>/.venv-tf).
set(SPARSYNC_TF_PYTHON "${CMAKE_SOURCE_DIR}/.venv-tf/bin/python" CACHE FILEPATH
    "Python with TensorFlow, for the TensorFlow op library (shims/tensorflow)")
set(SPARSYNC_TF_FOUND FALSE)
if(NOT EXISTS "${SPARSYNC_TF_PYTHON}")
  message(STATUS "TensorFlow op library: skipped (no ${SPARSYNC_TF_PYTHON}; "
                 "deploy/install_deps.sh creates it)")
  return()
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env TF_CPP_MIN_LOG_LEVEL=3 ${SPARSYNC_TF_PYTHON} -c
          "import tensorflow as tf; s = tf.sysconfig; print(tf.__version__); print('|'.join(s.get_compile_flags())); print('|'.join(s.get_link_flags()))"
  OUTPUT_VARIABLE _tf_out ERROR_VARIABLE _tf_err RESULT_VARIABLE _tf_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _tf_rc EQUAL 0)
  message(STATUS "TensorFlow op library: skipped (${SPARSYNC_TF_PYTHON} cannot import "
                 "tensorflow: ${_tf_err})")
  return()
endif()
string(REPLACE "\n" ";" _tf_lines "${_tf_out}")
list(GET _tf_lines 0 SPARSYNC_TF_VERSION)
list(GET _tf_lines 1 _tf_cflags)
list(GET _tf_lines 2 _tf_lflags)
string(REPLACE "|" ";" _tf_cflags "${_tf_cflags}")
string(REPLACE "|" ";" _tf_lflags "${_tf_lflags}")
set(SPARSYNC_TF_DEFINITIONS "")
set(SPARSYNC_TF_CXX_STANDARD 17)
foreach(_f IN LISTS _tf_cflags)
  if(_f MATCHES "^-I(.+)")
    set(SPARSYNC_TF_INCLUDE_DIR "${CMAKE_MATCH_1}")
  elseif(_f MATCHES "^-D(.+)")
    list(APPEND SPARSYNC_TF_DEFINITIONS "${CMAKE_MATCH_1}")
  elseif(_f MATCHES "^-?-std=c\\+\\+([0-9]+)")
    set(SPARSYNC_TF_CXX_STANDARD "${CMAKE_MATCH_1}")
  endif()
endforeach()
foreach(_f IN LISTS _tf_lflags)
  if(_f MATCHES "^-L(.+)")
    set(_tf_libdir "${CMAKE_MATCH_1}")
  elseif(_f MATCHES "^-l:(.+)")
    set(_tf_libname "${CMAKE_MATCH_1}")
  endif()
endforeach()
set(SPARSYNC_TF_FRAMEWORK "${_tf_libdir}/${_tf_libname}")
if(NOT SPARSYNC_TF_INCLUDE_DIR OR NOT EXISTS "${SPARSYNC_TF_FRAMEWORK}")
  message(STATUS "TensorFlow op library: skipped (tf.sysconfig gave no usable flags: "
                 "${_tf_cflags} ${_tf_lflags})")
  return()
endif()
set(SPARSYNC_TF_FOUND TRUE)
message(STATUS "TensorFlow op library: TensorFlow ${SPARSYNC_TF_VERSION} (${SPARSYNC_TF_PYTHON}), "
               "C++${SPARSYNC_TF_CXX_STANDARD}, ${SPARSYNC_TF_DEFINITIONS}")
