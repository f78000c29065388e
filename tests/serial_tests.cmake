# Run by ctest after the discovered gtest cases (tests/CMakeLists.txt): the ones that measure the
# whole process (its page faults) run with no other test beside them.
set_tests_properties(ExecutorMemory.ARunAfterTheFirstAllocatesOnlyItsOutputAndTouchesNoFreshPage PROPERTIES RUN_SERIAL TRUE)
