"""Fault tolerance and elastic growth, ULFM-style: detect, revoke, shrink, agree, rebuild, go on."""
