# The new document's Data Generator API: DataGeneratorParams and DataGenerator.generate, here
# writing the Wide&Deep-shaped Norm data the training samples read (./wdl_norm): 1 label, 13
# dense features, 28 one-hot slots (2 wide, 26 deep), 64-bit keys.
# Sizes shrunk (files, samples, vocabularies) so the suite stays fast.
import tierserve.trainer as hugectr

data_generator_params = hugectr.tools.DataGeneratorParams(
    format = hugectr.DataReaderType_t.Norm,
    label_dim = 1,
    dense_dim = 13,
    num_slot = 28,
    i64_input_key = True,
    source = "./wdl_norm/file_list.txt",
    eval_source = "./wdl_norm/file_list_test.txt",
    slot_size_array = [500] * 2 + [100] * 26,
    nnz_array = [1] * 28,
    check_type = hugectr.Check_t.Sum,
    dist_type = hugectr.Distribution_t.PowerLaw,
    power_law_type = hugectr.PowerLaw_t.Short,
    num_files = 2,
    eval_num_files = 1,
    num_samples_per_file = 2048)
data_generator = hugectr.tools.DataGenerator(data_generator_params)
data_generator.generate()
