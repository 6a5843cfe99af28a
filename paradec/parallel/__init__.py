"""ASPD: independent segments of an answer — their extraction, markup, and (later) decoding."""
