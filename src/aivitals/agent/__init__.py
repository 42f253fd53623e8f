"""aivitals.agent"""
