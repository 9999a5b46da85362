"""Tests of kvgate.store."""
