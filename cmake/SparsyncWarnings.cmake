# sparsync_target_warnings(<target>): the project's warning set, as errors with SPARSYNC_WERROR.
function(sparsync_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(SPARSYNC_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(SPARSYNC_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(SPARSYNC_FUZZ)
    # Coverage for libFuzzer in every target; the fuzz targets add -fsanitize=fuzzer (main).
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link,address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(SPARSYNC_TSAN)
    target_compile_options(${target} PRIVATE -fsanitize=thread -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
endfunction()

# sparsync_test_code_options(<target>): a test executable's own files at -O1 with line tables
# (-g1) in the default build type. Its files are GoogleTest and gmock code, whose code generation
# at -O2 -g is half of the main tree's compile time; the libraries under test keep -O2 -g, and
# the sanitizer trees are at -O1 -g1 already (CMakeLists.txt).
function(sparsync_test_code_options target)
  target_compile_options(${target} PRIVATE
    "$<$<AND:$<CONFIG:RelWithDebInfo>,$<COMPILE_LANGUAGE:CXX>>:-O1;-g1>")
endfunction()
