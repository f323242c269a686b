"""IO: reading and writing ONNX files without holding their weights. The protobuf wire format
(`wire`), a one-file model read with its large tensors left in the file (`proto_read`) and
written by streaming them (`proto_write`), tensors read by blocks of rows from wherever they are
(`tensor_io`), the graphs a proto nests (`proto_graphs`), every tensor's data checked against its dims as a model is read (`tensor_data`),
models with external data (`external_data`), and scratch folders (`scratch`).

Takes paths and `onnx_ir` models; gives models whose large tensors are lazy, and files.
"""
