"""pytest plugin (entry point ``pytest11``): fixtures for drafter authors."""
