# The new document's Data Generator API writing the Raw and Parquet data that its
# DataReaderParams examples read: 1 label, 3 dense features, 4 one-hot slots with the
# Parquet example's slot_size_array.  Raw labels and dense features are written as int32
# (float_label_dense defaults to False here and in DataReaderParams, as in HugeCTR's
# binding).  Sizes shrunk.
import tierserve.trainer as hugectr

for data_format, source, eval_source, i64_input_key in [
        (hugectr.DataReaderType_t.Raw, "./wdl_raw/train_data.bin",
         "./wdl_raw/validation_data.bin", False),
        (hugectr.DataReaderType_t.Parquet, "./parquet_data/train/_file_list.txt",
         "./parquet_data/val/_file_list.txt", True)]:
    data_generator_params = hugectr.tools.DataGeneratorParams(
        format = data_format,
        label_dim = 1,
        dense_dim = 3,
        num_slot = 4,
        i64_input_key = i64_input_key,
        source = source,
        eval_source = eval_source,
        slot_size_array = [10000, 50000, 20000, 300],
        check_type = hugectr.Check_t.Non,
        dist_type = hugectr.Distribution_t.PowerLaw,
        power_law_type = hugectr.PowerLaw_t.Short,
        num_files = 2,
        eval_num_files = 1,
        num_samples_per_file = 1024,
        num_samples = 2048,
        eval_num_samples = 1024)
    data_generator = hugectr.tools.DataGenerator(data_generator_params)
    data_generator.generate()
