/* cli_text: `duoserve tokenize`, `detokenize` and `chat-template` (see cli_text.c). */
#ifndef DUO_CLI_TEXT_H
#define DUO_CLI_TEXT_H

int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_chat_template(int argc, char **argv);

#endif
