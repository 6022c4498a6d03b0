target_sources(gaac PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/thread_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_loader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward.cpp)
