/* Every vkswarm subcommand: int cmd_NAME(int argc, char **argv), argv[0] is the command name. */
#ifndef VKS_COMMANDS_H
#define VKS_COMMANDS_H
int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);   /* issue 3: tools/cmd_tokenize.c */
int cmd_detokenize(int argc, char **argv); /* issue 3 */
int cmd_convert(int argc, char **argv);    /* issue 3: tools/cmd_convert.c */
int cmd_pipeline(int argc, char **argv);   /* issue 4: tools/cmd_pipeline.c */
int cmd_verify(int argc, char **argv);     /* issue 5: tools/cmd_verify.c */
int cmd_keygen(int argc, char **argv);     /* issue 6: tools/cmd_broadcast.c */
int cmd_broadcast(int argc, char **argv);  /* issue 6 */
int cmd_train(int argc, char **argv);     /* tools/cmd_train.c: train sft */
int cmd_train_plan(int argc, char **argv); /* tools/cmd_train_plan.c: train plan (argv[0] = "plan") */
int cmd_eval(int argc, char **argv);
int cmd_tasks(int argc, char **argv);     /* tools/cmd_tasks.c: tasks sft, tasks filter */
int cmd_mpirun(int argc, char **argv);    /* tools/cmd_mpirun.c: mpirun with Ctrl-C as a clean stop */
int cmd_join(int argc, char **argv);      /* tools/cmd_join.c: join a running RL run */
int cmd_rl(int argc, char **argv);        /* tools/cmd_rl.c: the asynchronous RL run */
#endif
