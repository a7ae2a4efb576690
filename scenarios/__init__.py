"""Shipped scenarios as package data: platforms, workloads, designs, levers and their compositions."""
