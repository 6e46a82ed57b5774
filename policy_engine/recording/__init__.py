"""Runtime recorder and shadow evaluation: what each call keeps for replay; a candidate beside."""
