"""Notifications: messages for people, routed to named targets and grouped per rule."""
