"""aivitals.instrument"""
