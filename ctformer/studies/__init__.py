"""ctformer.studies"""
