// The unit that builds the tests' precompiled header (tests/CMakeLists.txt, sluice_test_pch).
