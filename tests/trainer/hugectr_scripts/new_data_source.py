# The new document's Data Source API: DataSourceParams and DataSource.move_to_local, on the
# local file system (use_hdfs=False; HDFS goes through fsspec's HDFS file system where pyarrow
# with libhdfs is installed).  Files: ./remote/file_list.txt, ./remote/train/,
# ./remote/wdl_0_sparse_4000.model/ (the "remote" side), copied to ./local.
import tierserve.trainer as hugectr

data_source_params = hugectr.data.DataSourceParams(
    use_hdfs = False,
    namenode = 'localhost',
    port = 9000,
    hdfs_train_source = './remote/train',
    hdfs_train_filelist = './remote/file_list.txt',
    hdfs_sparse_model = ['./remote/wdl_0_sparse_4000.model'],
    local_train_source = './local/train',
    local_train_filelist = './local/file_list.txt',
    local_sparse_model = ['./local/wdl_0_sparse_4000.model'])
data_source = hugectr.data.DataSource(data_source_params)
data_source.move_to_local()
