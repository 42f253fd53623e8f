"""aivitals.diagnose"""
