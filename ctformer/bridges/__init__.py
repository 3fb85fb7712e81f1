"""ctformer.bridges"""
