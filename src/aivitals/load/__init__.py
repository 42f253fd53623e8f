"""aivitals.load"""
