# The old document's "Non-epoch Mode Training" sample.  Departures: `from mpi4py import MPI`
# left out (one process); sizes shrunk (batch sizes 256, max_eval_batches 2, 20 iterations,
# the loss every 10 and an evaluation every 10 instead of 100 and 1000).  vvgpu and mixed
# precision are kept as the document has them: they warn (one device; float32 on the CPU).
# Files: your_config.json (the JSON-configured model, here one Model.graph_to_json wrote,
# whose Data layer names 32-bit Norm data).
from tierserve.trainer import Session, solver_parser_helper,get_learning_rate_scheduler
json_file = "your_config.json"
solver_config = solver_parser_helper(seed = 0,
                                    batchsize = 256,
                                    batchsize_eval = 256,
                                    max_eval_batches = 2,
                                    model_file = "",
                                    embedding_files = [],
                                    vvgpu = [[0,1,2,3,4,5,6,7]],
                                    use_mixed_precision = True,
                                    scaler = 1024,
                                    i64_input_key = False,
                                    use_algorithm_search = True,
                                    use_cuda_graph = True,
                                    repeat_dataset = True)
lr_sch = get_learning_rate_scheduler(json_file)
sess = Session(solver_config, json_file)
sess.start_data_reading()
for i in range(20):
    lr = lr_sch.get_next()
    sess.set_learning_rate(lr)
    sess.train()
    if (i%10 == 0):
        loss = sess.get_current_loss()
        print("[HUGECTR][INFO] iter: {}; loss: {}".format(i, loss))
    if (i%10 == 0 and i != 0):
        sess.check_overflow()
        sess.copy_weights_for_evaluation()
        for _ in range(solver_config.max_eval_batches):
            sess.eval()
        metrics = sess.get_eval_metrics()
        print("[HUGECTR][INFO] iter: {}, {}".format(i, metrics))
sess.download_params_to_files("./", 20)
metrics = sess.evaluation("predictions.txt", "labels.txt")
