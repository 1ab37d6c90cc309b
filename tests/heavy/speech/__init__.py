"""The voice recognisers as processes of their own, killed and replaced."""
