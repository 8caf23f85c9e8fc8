"""Test helpers: tiny model folders, scripted models, subprocess workers, shared configurations."""
