# Tokenizers (byte-level BPE and SentencePiece-style BPE) read from GGUF vocabularies.
target_sources(gaac PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bpe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_spm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/unicode_tables.cpp
)
