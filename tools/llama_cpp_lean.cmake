# The judge server's build (`make judge-env`), made shorter without touching what the server runs.
#
# CMake includes this file right after llama-cpp-python's top-level project() call (the Makefile passes
# -DCMAKE_PROJECT_llama_cpp_INCLUDE=<this file>). llama-cpp-python forces llama.cpp's `common` library on (argument
# parsing, chat-template parsers, an HTTP client: about a third of the compile), but its Python server loads only
# libllama and libggml. At the end of the configure step `common` and its HTTP client are left with one empty
# source file, so they still build and install (in a second) and nothing else changes. The model-graph code in
# libllama is compiled at -O1: it builds the compute graph; the arithmetic is ggml's, which keeps -O3.
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL arbor_lean_llama_build)

function(arbor_lean_llama_build)
  set(empty "${CMAKE_BINARY_DIR}/arbor_empty.cpp")
  file(WRITE "${empty}" "// emptied for arbor's judge server build: tools/llama_cpp_lean.cmake\n")
  foreach(target llama-common cpp-httplib)
    if(TARGET ${target})
      set_property(TARGET ${target} PROPERTY SOURCES "${empty}")
    endif()
  endforeach()
  if(TARGET llama)
    target_compile_options(llama PRIVATE -O1)
  endif()
endfunction()
