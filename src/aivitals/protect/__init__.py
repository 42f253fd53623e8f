"""aivitals.protect"""
