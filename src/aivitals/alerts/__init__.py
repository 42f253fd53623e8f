"""aivitals.alerts"""
