"""Helpers shared by the tests: ``paths`` (repository, assets, fixtures), ``server`` (test weights and a
loopback server), ``synth`` (small models and reference clips)."""
