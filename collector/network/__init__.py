"""Packets and flows: pcap/pcapng reading, flow bursts and flow records, live capture."""
