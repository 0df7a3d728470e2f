"""Serving hidden states instead of text: embeddings (the last token's final hidden state) and
reranking (a reranker's yes/no verdict on a query and a document)."""
