"""ctformer.particles"""
